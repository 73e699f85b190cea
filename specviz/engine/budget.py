"""Adaptive verification: verify only the draft slots that are likely to survive (DSpark, vLLM's
`enable_adaptive_verification`).

Every row drafts; every drafted slot (row r, position j) gets a survival probability

    S(r, j) = c(r, 1) · c(r, 2) · … · c(r, j),

the chance that the target keeps drafts 1..j. The step then verifies a global budget of B slots, the
B with the highest survival over the whole batch. Because S only falls along a row, those B slots are
a prefix of each row's draft: position 5 of a confident row can beat position 1 of an unsure one, and
a row may verify nothing and decode one token. B is chosen each step as

    B* = argmax_B (rows + Σ_{top B} S) ÷ (draft_s + overhead_s + verify_s(rows + B)),

expected tokens over expected seconds, from cost tables measured on this machine.

Whose progress counts. That ratio is the batch's rate while every token any row gains brings the end
of some request nearer that others wait for: with requests waiting for room, a row that finishes lets
one in. When nobody waits, a batch ends with its last row, and a row that runs ahead of it does not end
the batch sooner: past the knee its accepted drafts only move work from later passes into this one, and
its rejected ones are pure cost. So then the step is planned for the last row (`_class_plan`): the last
row (ties included) moves l places further than plain decoding iff every row fewer than l places ahead
of it keeps that many of its drafts, probability Π S; the plan verifies, level by level, the drafts
that move it, and picks the level with the most progress per second. A class of 16 that starts together
needs 16 survivals at once, so it verifies little; one row alone is the per-slot rule above. Below the
knee (a token more in every row costs at most `FREE_SHARE` more) a row running ahead costs the class
nothing, so there the per-slot rule decides too.
Measured on the grounded class (docs/BENCHMARKS.md): with the per-slot rule, the rows with good matches
ran ahead and the class ended on a tail of light passes, 0.83–0.97× no speculation at 16 users.

Where the confidences come from:
- a model (or layer-skip) draft: the draft's top probability at that position, calibrated against the
  acceptance measured at that position and confidence (`Calibration`), so that S predicts acceptance;
- n-gram: no probabilities, so c is the acceptance measured at that position for drafts that came from
  a match of that length, learnt online.
Both tables also learn, each step, the first slot a row drafted but did not verify when it kept all it
verified (`Hindsight`: the target's next token says whether that draft would have survived), so a
position the budget left out is still measured and a too-pessimistic start corrects itself.

Exactness. Greedy rows are exact whatever is verified (the target's argmax decides). A sampled row
with a model draft is exact only if the decision to verify position j never looks at the token drawn
at j or after it; the top-B choice of this step does (S(r, j+1) depends on d_j). So a sampled model row
verifies the positions whose survival clears the cut-off *of the previous step* (`cutoff`): its
confidences depend only on the tokens before each position, and the cut-off only on the past.
n-gram drafts are a fixed function of the context, so every row may use this step's B*.

The draft depth. DSpark drafts a block in one pass; a model draft here pays a pass per position. So
model rows draft to the depth with the best expected tokens per second (measured draft cost by rows,
verify cost, mean survival per position), stop drafting once their raw survival falls well under the
last cut-off, and probe one position now and then after choosing not to draft, ever more rarely while
probes find nothing worth drafting. A probe drafts in one row, the one with the least to catch up: a row
that has not drafted for a while must first feed the draft model every token since, and a probe in every
row was a draft prefill of the whole class (a layer-skip draft that verified almost nothing ran 0.68× no
speculation at 16 users). Even in one row that catch-up is a prefill (~80 ms for a 100-token prompt, a
sixth of a one-user class of 24 tokens), so a probe also waits until the serving time since the last
one is 1 ÷ PROBE_SHARE times its estimated price, and never comes where a draft that every target
kept would still not pay. n-gram drafting costs little, so it drafts the full depth, except where no
plan could verify any draft whatever it is (`could_verify`: many level rows past the knee): there it
drafts nothing, and the step costs what plain decoding's does.

Ownership: the engine owns one `Budget` and calls it from the thread that steps the batch.
"""
from __future__ import annotations

import bisect
import statistics
from dataclasses import dataclass, field

CONF_BINS = 10           # raw-confidence bins of the calibration table
POSITIONS = 8            # positions told apart (deeper ones share the last entry)
PRIOR_WEIGHT = 4.0       # pseudo-counts for the prior (the raw confidence, or NGRAM_PRIOR)
NGRAM_PRIOR = 0.5
MAX_COUNT = 400.0        # counts decay past this, so the tables follow a changing workload
DRAFT_STOP = 0.25        # model rows stop drafting below this fraction of the last cut-off
FORGET = 0.995           # per step: a count's weight halves in ~140 steps
PROBE_EVERY = 32         # steps without a verified draft before model rows draft again …
PROBE_MAX = 256          # … doubling after each probe that did not make drafting pay, up to this …
PROBE_SHARE = 0.02       # … and at most this share of the serving time spent on probes (their catch-up)
BASE_EVERY = 64          # steps before the pass with no drafts (tokens = rows) is measured again …
BASE_MARGIN = 1.15       # … when B* promised less than this × the rate of verifying nothing
# below the knee — a token more in every row costs at most this share more — every row's drafts count (the
# slot plan), past it the last row's plan. A flat pass is where a row running ahead is free (and its drafts
# hedge: it may yet fall back to last place); where a token more a row costs more, those drafts are paid for
# and end nothing. Measured at 4 users (AMD EPYC Zen 4, 3 Dec, n-gram, grounded class, the two budgets as
# arms of one run, paired class by class): at 0.30 — where a token more a row there, +10–26 %, counted as
# free — the slot plan verified 3.2–4.6 drafts a step; the last row's plan verified 0.9 and ran 1.050× and
# 1.021× it in two runs (against fixed k = 2: 1.023× and 0.995×). The 0.30 came from a run on the Zen 5
# EPYC before the frontier's first-class and cost-table biases were found; not measured there since.
FREE_SHARE = 0.05


def monotone(xs: list[int], ys: list[float]) -> list[float]:
    """The non-decreasing fit of ys over increasing xs (pool-adjacent-violators, weights equal):
    a bigger pass never costs less, whatever noise the timings carry."""
    blocks: list[list[float]] = []      # [sum, count]
    for y in ys:
        blocks.append([y, 1.0])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
            s, c = blocks.pop()
            blocks[-1][0] += s
            blocks[-1][1] += c
    out: list[float] = []
    for s, c in blocks:
        out += [s / c] * int(c)
    return out


def _running_product(cs: list[float]) -> list[float]:
    """S(j) = c(1) · … · c(j), each confidence clipped to [0, 1]."""
    out, s = [], 1.0
    for c in cs:
        s *= min(1.0, max(0.0, c))
        out.append(s)
    return out


# A size's observed cost is the median of its last RECENT observations, and where a warm-up profile can
# stand in for it, it expires STALE observations (of the whole table) after its last one. Why: one slow
# step (the 2-core machine preempted) read 20.1 ms for a 7-token pass among 11.9-13.5 ms for 1-9 tokens;
# as a moving average it stayed, the monotone fit priced 7-9 tokens at 15.6 ms, and the budget stopped
# verifying 7 tokens, so nothing measured that size again. At one user it then cut 19 % of the n-gram
# drafts fixed k = 8 kept (their survival 0.15, measured 0.16) and took 4 % more steps (AMD EPYC, 3 Dec).
RECENT = 5
STALE = 50


@dataclass
class CostTable:
    """Seconds by size (tokens per verify pass, or rows), from observed steps, optionally seeded by a
    profile measured at warm-up. A query is the monotone fit, interpolated; above the largest size it
    grows along the last measured slope, below the smallest it stays flat."""

    seed: dict[int, float] = field(default_factory=dict)     # size → seconds, measured at warm-up
    seen: dict[int, float] = field(default_factory=dict)     # size → seconds, observed (recent median)
    _fit: tuple[list[int], list[float]] | None = None
    _recent: dict[int, list[float]] = field(default_factory=dict, repr=False)   # size → last RECENT seconds
    _last: dict[int, int] = field(default_factory=dict, repr=False)             # size → observation number
    _count: int = 0
    _seed_xs: list[int] = field(default_factory=list, repr=False)    # the seed's sizes, sorted once

    def __post_init__(self) -> None:
        self._seed_xs = sorted(self.seed)

    def observe(self, size: int, seconds: float) -> None:
        recent = self._recent.setdefault(size, [])
        recent.append(seconds)
        del recent[:-RECENT]
        self.seen[size] = statistics.median(recent)
        self._count += 1
        self._last[size] = self._count
        self._fit = None

    def _fresh(self) -> dict[int, float]:
        """The observed sizes still trusted: all of them without a seed to fall back on, else those
        observed in the last STALE observations (an expired size is priced from the scaled seed until a
        step measures it again). The count moves only in `observe`, which drops the cached fit."""
        if not self.seed:
            return self.seen
        return {n: v for n, v in self.seen.items() if self._count - self._last.get(n, self._count) < STALE}

    def __bool__(self) -> bool:
        return bool(self.seed or self.seen)

    def at(self, size: int) -> float:
        xs, ys = self._fitted()
        if not xs:
            return 0.0
        i = bisect.bisect_left(xs, size)
        if i < len(xs) and xs[i] == size:
            return ys[i]
        if i == 0:
            return ys[0]
        if i == len(xs):
            if len(xs) == 1:
                return ys[0]
            slope = max(0.0, (ys[-1] - ys[-2]) / (xs[-1] - xs[-2]))
            return ys[-1] + slope * (size - xs[-1])
        w = (size - xs[i - 1]) / (xs[i] - xs[i - 1])
        return ys[i - 1] * (1 - w) + ys[i] * w

    def _fitted(self) -> tuple[list[int], list[float]]:
        """Observed sizes win; the seed fills the sizes not seen yet, scaled by how far the observed
        steps sit from it (a profile of one long row is not a step of many short ones). Refitted after
        every observation, so once per step: kept to one pass over each table."""
        if self._fit is None:
            seen = self._fresh()
            points = dict(self.seed)
            if self.seed and seen:
                ratios = []
                for n, s in seen.items():
                    at = self._seed_at(n)
                    if at > 0:
                        ratios.append(s / at)
                ratios.sort()
                scale = ratios[len(ratios) // 2] if ratios else 1.0
                points = {n: s * scale for n, s in self.seed.items()}
            points.update(seen)
            xs = sorted(points)
            self._fit = (xs, monotone(xs, [points[x] for x in xs]))
        return self._fit

    def _seed_at(self, n: int) -> float:
        xs = self._seed_xs
        i = bisect.bisect_left(xs, n)
        if i < len(xs) and xs[i] == n:
            return self.seed[n]
        if i == 0 or i == len(xs):
            return self.seed[xs[min(i, len(xs) - 1)]]
        w = (n - xs[i - 1]) / (xs[i] - xs[i - 1])
        return self.seed[xs[i - 1]] * (1 - w) + self.seed[xs[i]] * w


class RowCosts:
    """Verify seconds by tokens per pass, one CostTable per batch-rows class (powers of two): 64 tokens
    as 64 rows × 1 cost far more than 4 rows × 16 (64 caches to attend over, another fast-path row class),
    so one table by tokens alone, learnt at a small class, prices a large one wrong. Each class's table
    starts from the warm-up profile (one row of N tokens) and is scaled by its own observed steps; a class
    not seen yet borrows the nearest class that has been."""

    def __init__(self, seed: dict[int, float] | None = None):
        self.seed = dict(seed or {})
        self.tables: dict[int, CostTable] = {}

    @staticmethod
    def row_class(rows: int) -> int:
        return 1 << max(0, int(rows) - 1).bit_length()

    def __bool__(self) -> bool:
        return bool(self.seed) or any(self.tables.values())

    def observe(self, rows: int, tokens: int, seconds: float) -> None:
        c = self.row_class(rows)
        self.tables.setdefault(c, CostTable(seed=dict(self.seed))).observe(tokens, seconds)

    def table(self, rows: int) -> CostTable:
        """The table a step of `rows` rows is priced from (looked up once per step, not once per slot)."""
        c = self.row_class(rows)
        seen = [k for k, t in self.tables.items() if t.seen]
        if c not in seen and seen:     # the nearest class, in factors of two (ties: the larger, dearer)
            c = min(seen, key=lambda k: (abs(k.bit_length() - c.bit_length()), -k))
        return self.tables.get(c) or CostTable(seed=self.seed)

    def at(self, rows: int, tokens: int) -> float:
        return self.table(rows).at(tokens)


@dataclass
class Calibration:
    """P(the target keeps slot j | it kept every slot before j), by (key, position): the key is a raw
    confidence bin for model drafts and the match length for n-gram drafts. Counts start from a prior
    worth PRIOR_WEIGHT observations: the raw confidence for a model draft; for n-gram, the rate measured
    at that position over every match length (itself from NGRAM_PRIOR), so a match length seen for the
    first time starts from what the others taught, not from a guess."""

    pooled: bool = False
    reached: dict[tuple[int, int], float] = field(default_factory=dict)
    kept: dict[tuple[int, int], float] = field(default_factory=dict)
    pos_reached: dict[int, float] = field(default_factory=dict)     # by position, every key together
    pos_kept: dict[int, float] = field(default_factory=dict)
    # the counts above are stored divided by `_fade`, the product of every `forget` factor so far: a step's
    # fading is then one multiplication, not one per count (the loop over the four tables was the largest
    # single item of the budget's work in a one-row step that drafted nothing: EPYC Zen 4, cProfile)
    _fade: float = field(default=1.0, repr=False, compare=False)

    # derived from the counts above (cleared whenever they change): prior → rate by position
    _pooled_rates: dict[float, list[float]] = field(default_factory=dict, repr=False, compare=False)

    def rate(self, key: int, pos: int, prior: float) -> float:
        p = min(pos, POSITIONS - 1)
        if self.pooled:
            prior = self._pooled(prior)[p]
        n, f = self.reached.get((key, p), 0.0), self._fade
        return (self.kept.get((key, p), 0.0) * f + PRIOR_WEIGHT * prior) / (n * f + PRIOR_WEIGHT)

    def count(self, key: int, pos: int) -> float:
        """Slots of this key and position reached, faded as `forget` left them."""
        return self.reached.get((key, min(pos, POSITIONS - 1)), 0.0) * self._fade

    def _pooled(self, base: float) -> list[float]:
        """The rate by position over every key. A position seen rarely starts from the rate of the one
        before it, not from `base`: a draft that survived its first positions is a copied span and
        tends to go on (measured on the grounded prompts: ~0.5 at the first position, 0.8–1.0 after),
        so a fixed prior at depth made the budget stop short where k = 8 kept 3 drafts a step."""
        rates = self._pooled_rates.get(base)
        if rates is None:
            rates, prior, f = [], base, self._fade
            for p in range(POSITIONS):
                prior = ((self.pos_kept.get(p, 0.0) * f + PRIOR_WEIGHT * prior)
                         / (self.pos_reached.get(p, 0.0) * f + PRIOR_WEIGHT))
                rates.append(prior)
            self._pooled_rates[base] = rates
        return rates

    def forget(self, factor: float) -> None:
        """Fade every count a little, so a slot class that stopped being verified drifts back to its
        prior and is tried again."""
        self._fade *= factor
        if self._fade < 1e-100:       # ~46,000 steps at 0.995: fold the fade into the counts before it underflows
            for table in (self.reached, self.kept, self.pos_reached, self.pos_kept):
                for k in table:
                    table[k] *= self._fade
            self._fade = 1.0
        self._pooled_rates.clear()

    def observe(self, key: int, pos: int, kept: bool) -> None:
        self.observe_many(key, pos, 1, int(kept))

    def observe_many(self, key: int, pos: int, reached_n: int, kept_n: int) -> None:
        """`reached_n` slots of this key and position reached in one step, `kept_n` of them kept (a step's
        64 rows are one update here, not 64: ~0.15 ms of a 64-row step)."""
        p, f = min(pos, POSITIONS - 1), self._fade
        for reached, kept_, k in ((self.reached, self.kept, (key, p)), (self.pos_reached, self.pos_kept, p)):
            n, a = reached.get(k, 0.0) * f + reached_n, kept_.get(k, 0.0) * f + kept_n
            if n > MAX_COUNT:
                a, n = a * MAX_COUNT / n, MAX_COUNT
            reached[k], kept_[k] = n / f, a / f
        self._pooled_rates.clear()


@dataclass(frozen=True)
class Hindsight:
    """What the step tells about the first slot it did not verify: a row that verified k of its drafts and
    kept all k emits the target's own token at k, so draft k would have been kept iff it equals that token
    (greedy). For a sampled row with a fixed (n-gram) draft d the two events have the same probability,
    p(d); a sampled model draft is accepted with min(1, p/q) instead, so those rows are left out."""

    drafts: object                 # [B, K] every drafted token, before the budget cut
    proposed: list[int]            # per row: drafts proposed
    next_tokens: list[int]         # per row: the token the target emitted after the kept drafts
    greedy: list[bool]


@dataclass(frozen=True)
class Selection:
    """What the scheduler decided in one step."""

    lengths: list[int]         # per row: drafts offered to the verify pass
    drafted: int               # draft slots the drafter proposed, all rows
    verified: int              # of which verified
    budget: int                # B* (the slots chosen by this step's argmax; sampled model rows aside)


def class_gaps(remaining: list[int], survivals: dict[int, list[float]]) -> dict[int, int] | None:
    """Per budgeted row, how many tokens fewer it has left than the row with the most (0: on the batch's
    last place, ties included); None where no budgeted row is within reach of it (the plan then has
    nothing to move)."""
    if not remaining or not survivals:
        return None
    top = max(remaining)
    return {i: top - remaining[i] for i in survivals}


def _count(seen: dict, key: int, pos: int, kept: bool) -> None:
    got = seen.setdefault((key, pos), [0, 0])
    got[0] += 1
    got[1] += int(kept)


def _bin(c: float) -> int:
    return min(CONF_BINS - 1, max(0, int(c * CONF_BINS)))


class Budget:
    """The batch-wide verification budget (see the module docstring)."""

    def __init__(self, verify_seed: dict[int, float] | None = None, padded: bool = False,
                 draft_seed: dict[int, float] | None = None):
        # seconds by tokens per verify pass: real tokens where the forward skips holes (the fast path),
        # rows × (longest row + 1) where it multiplies the padding too (the stock modules)
        self.verify = RowCosts(verify_seed)
        self.padded = padded
        self.overhead = CostTable()        # seconds outside the forwards, by rows, in steps that verified drafts
        self.overhead_plain = CostTable()  # … and in steps that verified none (no acceptance, no holes)
        self.model_cal, self.ngram_cal = Calibration(), Calibration(pooled=True)
        self.cutoff = 0.0                  # survival of the last slot chosen in the previous step
        self.draft = CostTable(seed=dict(draft_seed or {}))   # seconds per draft pass, by rows
        self.pos_mean: dict[int, float] = {}   # position → mean survival over rows (moving average)
        self._step_depth = 0               # the depth rows drafted to this step
        self._idle = 0                     # steps in a row that chose not to draft (model drafts)
        self._probe_every = PROBE_EVERY    # idle steps before the next probe
        self._idle_s = 0.0                 # seconds served since the last probe or drafting step
        self._keys: list[list[int]] = []   # per row and position of the last selection: calibration key
        self._base_age: dict[int, int] = {}   # rows → steps since a pass of exactly `rows` tokens was timed
        self.probing = False               # this step's depth is a probe: the engine drafts it for one row

    # --- before drafting ---------------------------------------------------------------------------
    def draft_depth(self, depth: int, kind: str, rows: int, catchup: int = 0) -> int:
        """How deep rows under this budget draft this step (the slider's depth is the ceiling). n-gram
        drafts are free, so always the full depth; a model draft, the depth with the best expected
        tokens per second from the costs and the survival per position measured so far (the whole
        depth until a step has been measured), probing one position now and then after choosing 0.
        `catchup`: tokens the probe's row would first feed the draft model."""
        self._step_depth, self.probing = depth, False
        if kind != "model" or not self.draft or not self.verify:
            return depth
        rates = self._expected_rates(depth, rows)
        best = max(range(depth + 1), key=rates.__getitem__)
        if best:
            self._idle, self._probe_every, self._idle_s = 0, PROBE_EVERY, 0.0
        else:
            self._idle += 1
        if not best and self._idle >= self._probe_every and self._probe_pays(depth, rows, catchup, rates[0]):
            # each probe that does not make drafting pay doubles the wait for the next: its row first
            # feeds the draft model every token since it last drafted (a 1-user cell of 24 tokens ran
            # 0.87× no speculation on probes alone at a fixed 32 steps)
            self._idle, self._idle_s, best, self.probing = 0, 0.0, min(depth, 1), True
            self._probe_every = min(PROBE_MAX, 2 * self._probe_every)
        self._step_depth = best
        return best

    def _probe_pays(self, depth: int, rows: int, catchup: int, base: float) -> bool:
        """A probe now? Only if the serving time since the last probe covers its price 1 ÷ PROBE_SHARE
        times (the catch-up pass, the target's one-row pass of that many tokens scaled by the draft's
        price per pass against the target's, and one draft pass), and drafting could pay at all (every
        row drafting d, every draft kept, beats `base`, the rate of drafting none, for some d). The time
        test comes first: it is a few lookups, and it fails on all but one step in ~50."""
        one = self.verify.at(1, 1)
        ratio = self.draft.at(1) / one if one > 0 else 1.0
        price = ratio * self.verify.at(1, max(1, catchup)) + self.draft.at(rows)
        if self._idle_s * PROBE_SHARE < price:
            return False
        return max(self._expected_rates(depth, rows, all_kept=True)[1:], default=0.0) > base

    def _expected_rates(self, depth: int, rows: int, all_kept: bool = False) -> list[float]:
        """Per d in 0..depth: tokens per second if every row drafted and verified d positions (the verify
        pass then trims, so this is the upper end of what drafting d can bring); `all_kept`: were every
        draft accepted (the most drafting d could ever bring). The tables are looked up once for all d:
        with a model draft that drafts nothing, pricing each d apart cost ~0.17 ms of a 16 ms one-user
        step, 1 % of adaptive verification's speed against no speculation doing the same passes."""
        verify = self.verify.table(rows)
        fixed, per_pass = self.overhead.at(rows), self.draft.at(rows)
        out, kept, survival = [], 0.0, 1.0
        for d in range(depth + 1):
            gain = rows * (1.0 + (d if all_kept else kept))
            cost = fixed + d * per_pass + verify.at(rows * (1 + d))
            out.append(gain / max(cost, 1e-9))
            # mean survival at position d: measured, else the one before it × the prior
            survival = self.pos_mean.get(d, survival * NGRAM_PRIOR)
            kept += survival
        return out

    def draft_floor(self) -> float:
        """Model rows stop drafting once their raw survival falls below this."""
        return DRAFT_STOP * self.cutoff

    # --- after drafting ------------------------------------------------------------------------------
    def survival(self, prop, i: int, k: int, memo: dict, conf: list | None) -> tuple[list[float], list[int]]:
        """Row i's survival per drafted position (it drafted k), and the calibration key of each position.
        `memo`: one step's n-gram survivals by (match length, depth), shared by that step's rows; `conf`:
        the step's `prop.conf` as lists, read once (a tensor read per row cost ~12 µs, 0.8 ms of a 64-row
        step, where a model draft drafted nothing)."""
        if prop.match is not None:               # n-gram: measured acceptance by match length
            return self._ngram_survival(int(prop.match[i]), k, memo)
        if conf is not None:                     # model: calibrated top probability
            raw = conf[i][:k]
            keys = [_bin(c) for c in raw]
            cs = [self.model_cal.rate(b, j, c) for j, (b, c) in enumerate(zip(keys, raw))]
        else:
            cs, keys = [NGRAM_PRIOR] * k, [0] * k
        return _running_product(cs), keys

    def _ngram_survival(self, n: int, k: int, memo: dict) -> tuple[list[float], list[int]]:
        """An n-gram row's survival depends only on its match length and depth: computed once per step
        for each (n, k) (a class of 64 rows has a handful; per row it took ~1 % of a 64-row step under
        cProfile)."""
        got = memo.get((n, k))
        if got is None:
            cs = [self.ngram_cal.rate(n, j, NGRAM_PRIOR) for j in range(k)]
            got = memo[(n, k)] = (_running_product(cs), [n] * k)
        return list(got[0]), list(got[1])

    def select(self, prop, chosen: list[bool], sampled: list[bool], fixed_s: float, rows: int,
               remaining: list[int] | None = None, waiting: bool = False) -> Selection:
        """Per row, how many of its drafts to verify. Rows not `chosen` (other policies) keep theirs.
        With requests waiting for room (or no `remaining`), B* is the argmax over every chosen row's
        slots (`_argmax`), and so below the knee; with nobody waiting past it, the plan that brings the
        batch's last row nearest per second (`_class_plan`). Greedy and n-gram rows verify their part;
        `sampled` rows with a model draft keep the slots above the previous step's cut-off (see
        Exactness) and this step's cut-off is stored for the next. `fixed_s`: the draft seconds; `remaining`: per row, the tokens it may still
        emit; `waiting`: requests wait for room in the batch."""
        lengths = prop.lengths.tolist()
        fixed_tokens = rows
        self._keys = [[] for _ in lengths]
        memo: dict = {}              # this step's n-gram survival by (match length, depth)
        survivals: dict[int, list[float]] = {}
        conf = prop.conf.tolist() if prop.conf is not None and prop.match is None and any(lengths) else None
        for i, k in enumerate(lengths):
            if not chosen[i]:
                fixed_tokens += k
                continue
            survivals[i], self._keys[i] = self.survival(prop, i, k, memo, conf)
            lengths[i] = 0
        if prop.match is None:      # the mean survival by position prices a model draft's depth only
            self._learn_depth(survivals)
        # verifying nothing also skips the bookkeeping drafts bring (acceptance, holes, compaction): priced
        # apart, or a near-even choice tips towards verifying (measured ~1 ms of a 20 ms step at 4 rows)
        plain_s = fixed_s + self.overhead_plain.at(rows) if self.overhead_plain and fixed_tokens == rows else None
        costs = (fixed_s + self.overhead.at(rows), plain_s)
        gaps = None if waiting or remaining is None else class_gaps(remaining, survivals)
        if gaps is not None and self._below_knee(fixed_tokens, rows):
            # below the knee a row that runs ahead costs the class nothing (the pass costs the same with
            # it), so every row's expected tokens count: the slot plan. A class of 4 that started together
            # verified 6.1 drafts a step under the class plan and 7.4 under this one, 45 and 42 steps
            # (fixed k = 4: 43). Past the knee the last row's plan.
            gaps = None
        if gaps is None:
            plan, margin = self._slot_plan(survivals, lengths, fixed_tokens, rows, costs)
        else:
            plan, margin = self._class_plan(survivals, gaps, lengths, fixed_tokens, rows, costs)
        best = sum(plan.values())
        cut_by_past = prop.match is None and any(sampled[i] for i in survivals)
        if best and not cut_by_past and self._probe_base(rows, margin, fixed_tokens):
            plan = {}
        cutoff = self.cutoff
        for i, n in plan.items():
            lengths[i] += n
        for i, surv in survivals.items():
            if sampled[i] and prop.match is None:
                lengths[i] = sum(1 for s in surv if s >= cutoff)
        if survivals:     # the next step's cut-off: the least survival the plan took, a probe or not
            taken = [survivals[i][n - 1] for i, n in plan.items() if n] if best else []
            top = max((s[0] for s in survivals.values() if s), default=None)
            if taken or top is not None:
                self.cutoff = min(taken) if taken else min(1.0, top + 1e-6)
        self._forget()
        return Selection(lengths, sum(int(x) for x in prop.lengths.tolist()), sum(lengths), best)

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
            return verify.at(tokens)
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
                # deeper levels need these rows and more, each one draft further: they move the end no
                # more than this, at a dearer pass (64 level rows: nine levels of 64 products a step)
                break
            progress += p
            rate = progress / max(costs[0] + seconds(need), 1e-9)
            if rate > best_rate:
                best_level, best_rate = level, rate
        plan = {i: best_level - g for i, g in gaps.items() if g < best_level}
        return plan, best_rate / base if base > 0 else float("inf")

    def could_verify(self, remaining: list[int], waiting: bool, depth: int) -> bool:
        """Before n-gram drafting, every row under this budget: could the last row's plan verify any level,
        whatever the drafts turn out to be? Each row's survival at a position is at most the best any match
        length has there (`_best_ngram_survival`), so level l succeeds with probability at most the product
        of those bounds over the rows it needs; if even that progress, priced at the cheapest overhead,
        never beats verifying nothing, the step drafts nothing. Where it cannot pay this saves the drafting
        and the bookkeeping of a step with drafts: ~0.7 ms of a 64-row step (AMD EPYC Zen 4), which left
        adaptive verification ~1 % behind no speculation on identical work. The answer depends only on the
        costs, the tables and the rows' lengths, never on a draft (exactness: a depth chosen from the past)."""
        rows = len(remaining)
        if waiting or not rows or not self.verify or depth <= 0 or self._below_knee(rows, rows):
            return True
        verify = self.verify.table(rows)
        ovh = [t.at(rows) for t in (self.overhead, self.overhead_plain) if t]
        plain_s = self.overhead_plain.at(rows) if self.overhead_plain else (ovh[0] if ovh else 0.0)
        base = 1.0 / max(plain_s + verify.at(rows), 1e-9)
        cheapest = min(ovh, default=0.0)
        best = self._best_ngram_survival(depth)
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
            if progress / max(cheapest + verify.at(rows + sum(need)), 1e-9) > base:
                return True
        return False

    def _best_ngram_survival(self, depth: int) -> list[float]:
        """Per position 1..depth, the highest survival any n-gram match length has there."""
        keys = {k for k, _ in self.ngram_cal.reached} | {1, 2, 3}
        best = [0.0] * depth
        for key in keys:
            for j, s in enumerate(_running_product([self.ngram_cal.rate(key, j, NGRAM_PRIOR) for j in range(depth)])):
                best[j] = max(best[j], s)
        return best

    def _below_knee(self, tokens: int, rows: int) -> bool:
        """One more token in every row costs at most FREE_SHARE more than this pass of `tokens`. (The
        test looks a whole row-width ahead: one token more in a 64-row pass also costs under 2 %, yet it
        is a 64th of the work, not spare compute.)"""
        verify = self.verify.table(rows)
        return not self.padded and verify.at(tokens + rows) <= (1.0 + FREE_SHARE) * verify.at(tokens)

    def _probe_base(self, rows: int, margin: float, fixed_tokens: int) -> bool:
        """Verify nothing this step, to time the pass B* is weighed against (tokens = rows)? Only while
        that point is unmeasured or old and B* promised less than BASE_MARGIN × its rate: the table is
        otherwise filled from observed sizes above it and the warm-up profile, and a cost step between
        them (the fast path's row classes) would be priced wrong for good. The choice depends only on
        the step count and the costs, never on this step's draft tokens (exactness, see the docstring)."""
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
        best, best_rate, total = 0, gain / max(base_s + verify.at(tokens), 1e-9), gain
        base_rate = best_rate
        for b, (s, _, i) in enumerate(slots, start=1):
            total += s
            taken[i] += 1
            longest = max(longest, taken[i])
            tokens = rows * (longest + 1) if self.padded else fixed_tokens + b
            rate = total / max(fixed_s + verify.at(tokens), 1e-9)
            if rate > best_rate:
                best, best_rate = b, rate
        return best, best_rate / base_rate if base_rate > 0 else float("inf")

    def _learn_depth(self, survivals: dict[int, list[float]]) -> None:
        """Mean survival per position over the rows under the budget (0 past a row's drafts)."""
        if not survivals:
            return
        sums = [0.0] * self._step_depth
        for s in survivals.values():
            for j, v in enumerate(s[:self._step_depth]):
                sums[j] += v
        for j, total in enumerate(sums):
            mean = total / len(survivals)
            old = self.pos_mean.get(j)
            self.pos_mean[j] = mean if old is None else 0.7 * old + 0.3 * mean

    def _forget(self) -> None:
        self.model_cal.forget(FORGET)
        self.ngram_cal.forget(FORGET)

    # --- after verification ----------------------------------------------------------------------
    def observe(self, prop, verified: list[int], accepted: list[int], chosen: list[bool], rows: int,
                tokens: int, verify_s: float, overhead_s: float, after: Hindsight | None = None) -> None:
        """Learn from the step: acceptance per position (for the calibration tables) and the costs.
        `after` adds the first unverified slot of each row that kept everything it verified (see
        Hindsight): without it a position the budget stopped verifying would never be measured again,
        and a pessimistic prior would keep the budget short for good."""
        cal = self.ngram_cal if prop.match is not None else self.model_cal
        # one list for the whole batch: a tensor read per row cost ~3 µs each, 64 of them a step
        drafts = after.drafts.tolist() if after is not None else None
        seen: dict[tuple[int, int], list[int]] = {}     # (key, position) → [reached, kept] this step
        for i, (k, a) in enumerate(zip(verified, accepted)):
            if not chosen[i]:
                continue
            keys = self._keys[i] if i < len(self._keys) else []
            for j in range(min(k, a + 1, len(keys))):   # slot j was reached iff the ones before were kept
                _count(seen, keys[j], j, j < a)
            if after is not None and a == k and k < min(after.proposed[i], len(keys)) \
                    and (after.greedy[i] or prop.match is not None):
                _count(seen, keys[k], k, int(drafts[i][k]) == after.next_tokens[i])
        for (key, j), (n, kept) in seen.items():
            cal.observe_many(key, j, n, kept)
        if tokens:     # the engine passes rows + verified drafts, or the padded shape (self.padded)
            self.verify.observe(rows, tokens, verify_s)
            if tokens == rows:
                self._base_age[rows] = 0
        # a catch-up pass is a prefill of the backlog, not the price of a draft pass: left out
        passes = prop.passes - (1 if prop.catchup_s > 0 else 0)
        if passes > 0:
            self.draft.observe(rows, (prop.seconds - prop.catchup_s) / passes)
        (self.overhead_plain if tokens == rows else self.overhead).observe(rows, overhead_s)
        self._idle_s += prop.seconds + verify_s + overhead_s


SIZES = (1, 2, 4, 8, 16, 32, 64, 128)


QUICK_SIZES = (1, 2, 4, 8, 16, 32, 64)    # the lesson's profile: larger passes extend along the last slope


def verify_profile(model, device, dtype, new_cache=None, context: int = 64,
                   sizes: tuple[int, ...] = SIZES, quick: bool = False) -> dict[int, float]:
    """A warm-up profile of a forward pass: median seconds by tokens per pass (the knee measurement's
    curve, short). For the target it stands for the verify cost by tokens; for a model draft, the cost
    of one draft pass by rows (one token per row). `Budget` scales it to the steps it then observes.
    `quick` (the lesson, which must fit a minute on a 2-core CPU): 3 samples a size on one cache, ~5 s
    at one thread there instead of ~28 s."""
    from specviz.hardware.device import measure_latency

    secs = measure_latency(model, list(sizes), context, device, dtype, repeats=3 if quick else 5,
                           new_cache=new_cache, one_cache=quick)
    return dict(zip(sizes, monotone(list(sizes), secs)))


def pair_profiles(pair, context: int = 64, quick: bool = False) -> tuple[dict[int, float], dict[int, float] | None]:
    """Warm-up profiles for a pair: the target's verify cost, and the model draft's pass cost (None for
    n-gram, whose drafting costs no forward, or where the draft cannot be timed on its own)."""
    t = pair.target
    sizes = QUICK_SIZES if quick else SIZES
    verify = verify_profile(t.model, t.device, t.dtype, pair.target_cache, context, sizes, quick)
    drafter = pair.make_drafter()
    if getattr(drafter, "kind", "") != "model":
        return verify, None
    try:
        return verify, verify_profile(drafter.model, t.device, t.dtype, drafter.cache_factory, context, sizes, quick)
    except Exception:         # a layer-skip view may not run outside its own cache: learn it online
        return verify, None

